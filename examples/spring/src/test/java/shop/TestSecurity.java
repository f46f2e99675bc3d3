package shop;

import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.security.config.Customizer;
import org.springframework.security.config.annotation.web.builders.HttpSecurity;
import org.springframework.security.config.annotation.web.configurers.AbstractHttpConfigurer;
import org.springframework.security.core.userdetails.User;
import org.springframework.security.provisioning.InMemoryUserDetailsManager;
import org.springframework.security.web.SecurityFilterChain;

/**
 * Spring Security in the tests' application (test sources): every request is let through, and
 * one with HTTP Basic credentials is authenticated (alice, bob). OwnerFromAuthenticationTests
 * resolves the owner from that Authentication; the other tests keep the example's X-Owner-Id.
 */
@Configuration(proxyBeanMethods = false)
class TestSecurity {
    @Bean
    SecurityFilterChain testFilterChain(HttpSecurity http) throws Exception {
        return http.authorizeHttpRequests(a -> a.anyRequest().permitAll())
            .httpBasic(Customizer.withDefaults())
            .csrf(AbstractHttpConfigurer::disable)
            .build();
    }

    @Bean
    InMemoryUserDetailsManager testUsers() {
        return new InMemoryUserDetailsManager(
            User.withUsername("alice").password("{noop}alice-secret").roles("USER").build(),
            User.withUsername("bob").password("{noop}bob-secret").roles("USER").build());
    }
}
